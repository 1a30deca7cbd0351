"""Persistence under the home.

Modules: `db` (every SQL statement: events.db and vitals.db), `objects` (content-addressed
blobs), `ballast` (the file freed first when the disk is full), `provision` (making a home and
checking it before pulsed starts).
"""
