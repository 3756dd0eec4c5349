"""Embedding: model loading and the read -> embed -> write pipeline of one partition."""
