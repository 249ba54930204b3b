"""Speech pieces both sides of the engine boundary use, free of torch and of the speech
library: the embedded Whisper models and what marks a Whisper directory (`models`), audio
files to 16 kHz samples (`audio`, PyAV), Whisper's languages (`languages`)."""
