"""Adapters to host frameworks (AllenNLP, OpenNMT-py).  Each imports its framework lazily."""
