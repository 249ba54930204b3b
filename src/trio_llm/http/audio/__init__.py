"""POST /v1/audio/transcriptions and /v1/audio/translations (OpenAI's speech to text, on a
Whisper model's speech engine): protocol.py (the form and the answers), plan.py (form ->
AudioPlan), build.py (a transcription -> json, text, srt, vtt, verbose_json, or the
transcript.text.* events of a stream), endpoint.py (the handlers)."""
