"""Understand: rules composed as an onion.
"""
