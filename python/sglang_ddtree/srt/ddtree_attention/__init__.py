"""DDTREE's verify attention backends: `verify_backend.VerifyAttentionBackend` (the interface),
one module per SGLang attention backend a DDTREE verify runs on, named as that backend's file
in SGLang's ``layers/attention/`` (``triton_backend``, ``flashmla_backend``,
``flashinfer_backend``; ``triton_extend_backend``: triton's own custom-mask kernel), and the
registry (`attention_registry.VERIFY_BACKENDS`)."""
