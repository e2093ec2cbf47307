"""The doctor: checks with verdicts, evidence and remedies."""
