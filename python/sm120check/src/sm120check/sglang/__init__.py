"""SGLang on SM120: scan a release's source for the gaps that keep SM120 from working, and patch them.

Everything here reads SGLang's source with `ast`; nothing imports SGLang, torch or FlashInfer.
"""
