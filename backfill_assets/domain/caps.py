"""How long a provider's or a failure's free text may be where it is stored or shown (pure).

Providers send ids, codes and messages of any length (a hostile one, megabytes): each is cut
to its cap before it reaches a row, a log line or a report.
"""

# A dead letter's reason, a batch chunk's errors, a rejected input record's reason.
REASON_CHARS = 500
# An error event's message on a ledger row (and the part of it a dead letter's reason quotes).
ERROR_MESSAGE_CHARS = 300
# A provider's request id (``x-request-id``) on a ledger row.
REQUEST_ID_CHARS = 200
# A provider's error code (``error.code``), in rows and messages.
ERROR_CODE_CHARS = 60
# A provider's message once scrubbed (``provider_text.scrub``), and an id it sends.
PROVIDER_MESSAGE_CHARS = 160
PROVIDER_ID_CHARS = 128
