"""The values of aioqueue and how they are encoded: exceptions, limits, keys, records, codecs,
signing, encryption, cron. No Redis I/O and no event loop of its own.

May import: nothing of aioqueue outside this folder.
"""
