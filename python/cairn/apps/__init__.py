"""Proxy applications built on Cairn: ``cohmm`` (the database-assisted heterogeneous multiscale proxy)."""
