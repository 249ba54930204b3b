"""Pictures a request names by URL: where the server may read them from (`MediaPolicy`, the
`--allowed-media-domains`, `--allowed-local-media-path`, `--limit-mm-per-prompt` flags) and
reading them (`fetch.read_image`)."""

from trio_llm.http.media.fetch import read_image
from trio_llm.http.media.policy import MediaPolicy, add_media_flags, media_policy_of

__all__ = ["MediaPolicy", "add_media_flags", "media_policy_of", "read_image"]
