"""The built-in model: ``llama`` (decoder-only, RMSNorm, rotary, GQA, SwiGLU), with the
Hugging Face families llama, qwen2, qwen3 and mistral as options.

Registration lives in :mod:`.plugin` and options in :mod:`.options`, neither of which
imports torch; the model itself is in :mod:`.llama` (its sampling cache in
:mod:`.kv_cache`, its rotary table in :mod:`.rotary`). Hugging Face interop: reading a
folder (:mod:`.hf_folder`), its ``config.json`` as options (:mod:`.hf_config`) and the
parameter names (:mod:`.hf_keys`), all torch-free; export and loading in
:mod:`.hf_interop`.
"""
