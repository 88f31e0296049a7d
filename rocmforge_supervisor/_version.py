"""Version of this package and of the llama.cpp it is pinned to."""

__all__ = [
    "LLAMA_CPP_COMMIT",
    "LLAMA_CPP_SDIST",
    "LLAMA_CPP_SDIST_SHA256",
    "WHISPER_CPP_COMMIT",
    "WHISPER_CPP_SDIST",
    "WHISPER_CPP_SDIST_SHA256",
    "__version__",
]

__version__ = "0.1.0"

#: The gitlink of the ``llama.cpp`` submodule. llama-cpp-python 0.3.35 vendors exactly this commit,
#: which is why its sdist is the fallback source when the submodule is empty.
LLAMA_CPP_COMMIT = "4df29be4f4c3673f428170fda944a5b19f743bb8"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.35"
LLAMA_CPP_SDIST_SHA256 = "1139dbb54509074b70893fab8554e3b079aa9f4d312058ce4018ef0019e3de12"

#: whisper.cpp v1.8.5. PyPI's ``pywhispercpp==1.5.1`` sdist vendors it under ``whisper.cpp/``: every
#: one of its 1791 files is byte-identical to this commit's tree (checked against the git history).
WHISPER_CPP_COMMIT = "f24588a272ae8e23280d9c220536437164e6ed28"
WHISPER_CPP_SDIST = "pywhispercpp==1.5.1"
WHISPER_CPP_SDIST_SHA256 = "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5"
