# Setup: the same notebook runs in JupyterLab, Colab and Kaggle. On a hosted notebook without
# the course, clone it and install course_utils, keeping the torch the image ships.
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("course_utils") is None:
    repo = os.environ.get("COURSE_REPO", "https://github.com/distributed-recsys-course/course.git")
    if not os.path.isdir("course/course_utils"):  # a re-run after a failed install skips the clone
        clone = subprocess.run(["git", "clone", "-q", "--depth", "1", repo, "course"], capture_output=True, text=True)
        if clone.returncode != 0:
            raise RuntimeError(f"could not clone the course from {repo}: {clone.stderr.strip()}\n"
                               "Point COURSE_REPO at a copy you can reach (run `%env COURSE_REPO=https://...` "
                               "in a cell, then this cell again); on Kaggle, first switch Internet on in the "
                               "notebook's settings panel.")
    # --no-deps: never replace the image's torch; then only what the image may lack
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", "course"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "cloudpickle>=2.2", "numpy>=1.24",
                    "pandas>=2.0", "pyarrow>=14", "matplotlib>=3.7"], check=True)
    sys.path.insert(0, os.path.abspath("course"))
import course_utils  # noqa: F401
