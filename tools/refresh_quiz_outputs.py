"""Refresh the stored output of each chapter's quiz.ask(NN) cell from quiz/ (no kernel needed).

Run from the repository root after editing a quiz: python tools/refresh_quiz_outputs.py chapters/*.ipynb
The output is what quiz.ask displays in a kernel: {"text/plain", "text/markdown"} as display_data.
"""

import json
import re
import sys
from pathlib import Path

from course_utils.notebook import quiz


def lines(text):
    return text.splitlines(keepends=True)


for name in sys.argv[1:]:
    path = Path(name)
    nb = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for cell in nb["cells"]:
        m = cell["cell_type"] == "code" and re.search(r"quiz\.ask\(\s*(\d+)\s*\)", "".join(cell["source"]))
        if not m:
            continue
        text, markdown = quiz._render(quiz.load(int(m[1])))
        new = [
            {
                "data": {"text/markdown": lines(markdown), "text/plain": lines(text)},
                "metadata": {},
                "output_type": "display_data",
            }
        ]
        if cell["outputs"] != new:
            cell["outputs"], changed = new, changed + 1
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{path}: {changed} quiz cell(s) refreshed")
