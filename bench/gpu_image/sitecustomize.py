"""The GPU image as the rehearsals (``bench/gpu_check.sh --dry-run``, ``bench/gpu_science.sh --dry-run``) see it:
this folder first on PYTHONPATH makes every Python process fail to import what the image lacks (the packages named
in GPU_CHECK_BLOCKED, by default the data stage's: Biopython, Snakemake, jsonschema, isal) and ignore an editable
install of pmlm, which comes from PYTHONPATH there as it will on the image."""

import importlib.abc
import os
import sys


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in os.environ.get("GPU_CHECK_BLOCKED", "Bio,snakemake,jsonschema,isal").split(","):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not on the GPU image)")
        return None


sys.meta_path.insert(0, _Absent())
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
