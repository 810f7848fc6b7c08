"""Bodies of the processes the model stages start through :func:`laya_build.runner.run`,
each a plain function from a job (a dict) to a result (a dict), run in a fresh interpreter
with its own environment: ``package`` (the AOTInductor compile), ``verify`` (the package
alone against ``eager.pt``) and ``latency`` (the variants timed on the saved inputs)."""
