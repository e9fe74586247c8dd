"""A reference model on another process: an inference server's HTTP client (:mod:`ablate.serving.client`) and the
llama.cpp server ``ablate`` starts itself when no URL is given (:mod:`ablate.serving.engine`)."""
