"""The stack manifest's pins held against the wheels' own metadata: pip's resolver on the control node (`resolve`),
what a bump moves with it (`plan`), and the stack.yml edit that writes it (`stackfile`).

Standard library only, like the rest of the core: pip is run as a program, never imported.
"""
