"""What several test files share: a test file imports from here (or uses a fixture of
``tests/conftest.py``), never from another test file (tests/test_chapter_layout.py)."""
