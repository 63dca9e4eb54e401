import importlib.util, subprocess, sys  # noqa: E401, I001 -- setup: on Colab or Kaggle, install the release of the course this notebook belongs to
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--timeout", "60", "--", "distributed-recsys-course @ git+https://github.com/distributed-recsys-course/course@v0.1.0"], check=True, timeout=900) if importlib.util.find_spec("course_utils") is None else None
_ = subprocess.run([sys.executable, "-m", "course_utils.notebook.hosted", "0.1.0"], check=True, timeout=900)
