"""Version of this package and of the llama.cpp it is pinned to."""

__all__ = ["LLAMA_CPP_COMMIT", "LLAMA_CPP_SDIST", "LLAMA_CPP_SDIST_SHA256", "__version__"]

__version__ = "0.1.0"

#: The gitlink of the ``llama.cpp`` submodule. llama-cpp-python 0.3.35 vendors exactly this commit,
#: which is why its sdist is the fallback source when the submodule is empty.
LLAMA_CPP_COMMIT = "4df29be4f4c3673f428170fda944a5b19f743bb8"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.35"
LLAMA_CPP_SDIST_SHA256 = "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12"
