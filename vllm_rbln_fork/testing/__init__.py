"""Test machinery shipped with the tool: the tier runner (``build.py test``) and upstream conformance."""
