"""Granian (a Rust HTTP server) serving the Quart app of services.rest_quart: HTTP/1.1, HTTP/2 over TLS."""
