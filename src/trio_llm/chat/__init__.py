"""`trio-llm chat`: a conversation in the terminal, with a running server (`--url`) or with an
engine this process starts (MODEL: the nursery client, no HTTP).

How it is laid out: backends.py (what streams a reply: over HTTP, or from an engine in this
process, and the types they share), conversation.py (the terminal, the history, /commands, a
reply and its numbers), command.py (the flags, the read loop). cli.py adds the flags and runs
the command through the two names here.
"""

from trio_llm.chat.command import add_chat_arguments, run

__all__ = ["add_chat_arguments", "run"]
