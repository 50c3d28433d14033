"""The embedded world model: a small flow-matching DiT over pixels or a warp of the
prompt."""
