// The ⏱ and ⚙ markers in a notebook's outputs, explained where they appear: each one gets a
// tooltip (site/_ext/page_notes.py puts the longer note before the first marked output).
document.addEventListener("DOMContentLoaded", () => {
  const meaning = {
    "⏱": "⏱ a time, rate or bandwidth measured on the machine that ran this notebook: yours will differ",
    "⚙": "⚙ a value that depends on the machine (a metric's last digits, a float difference, a device name)",
  };
  for (const output of document.querySelectorAll(".cell_output pre")) {
    const walker = document.createTreeWalker(output, NodeFilter.SHOW_TEXT);
    const texts = [];
    while (walker.nextNode()) {
      if (/[⏱⚙]/u.test(walker.currentNode.nodeValue)) texts.push(walker.currentNode);
    }
    for (const text of texts) {
      const parts = text.nodeValue.split(/([⏱⚙])/u);
      const fragment = document.createDocumentFragment();
      for (const part of parts) {
        if (part in meaning) {
          const marker = document.createElement("abbr");
          marker.className = "course-marker";
          marker.title = meaning[part];
          marker.textContent = part;
          fragment.appendChild(marker);
        } else if (part) {
          fragment.appendChild(document.createTextNode(part));
        }
      }
      text.replaceWith(fragment);
    }
  }
});
