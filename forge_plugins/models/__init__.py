"""Built-in model families: ``llama`` (decoder-only, RMSNorm, rotary, GQA, SwiGLU).

Registration lives in :mod:`.plugin` and options in :mod:`.options`, neither of which
imports torch; the model itself is in :mod:`.llama` and Hugging Face interop in
:mod:`.hf_interop`.
"""
