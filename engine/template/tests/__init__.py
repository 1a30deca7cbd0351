"""Tests of the engine, run by the promote gate."""
