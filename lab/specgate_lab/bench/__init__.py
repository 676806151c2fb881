"""Load generation and the end-to-end policy benchmark (``specgate bench``)."""
