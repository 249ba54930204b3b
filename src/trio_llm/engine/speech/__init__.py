"""The speech engine kind: Whisper models in CTranslate2's format, run by faster-whisper.

Read `windows` (one 30-second window of many transcriptions per step) then `core` (SpeechCore,
what the engine process loop drives in place of EngineCore). Importing this package loads
neither torch nor the speech library; `core` loads the library when a model is built.
"""
