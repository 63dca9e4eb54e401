"""Entry points that launchers start: ``torchrun -m course_utils.scripts.<name>``.

Each module is a tiny script with a ``main()``; importing it does nothing. The
``runner`` module starts them from a notebook or a test, in a subprocess with a
timeout, and collects what each rank reported.

Taught in chapters 02, 04 and 08.
"""
