"""One module per stage. Each exposes a plain function from a spec (a dict) to a record
(a dict with a top-level "stage"); none of them knows about doit."""
