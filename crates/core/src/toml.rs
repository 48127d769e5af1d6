//! Loading machine definitions from TOML (see the DESIGN appendix for the format).
