"""Percept: sensors that sample the host into vitals.
"""
