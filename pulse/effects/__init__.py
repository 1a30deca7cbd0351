"""Execute: the effect kinds and what each does.
"""
