"""Persistence under the home, one module per store; every SQL statement Pulse runs is here.
"""
