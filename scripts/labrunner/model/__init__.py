"""The scenario matrix: matrix.toml validated and expanded into scenarios."""
