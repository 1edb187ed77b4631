"""aiohttp REST server: HTTP/1.1, cleartext or TLS, forked workers sharing the port."""
