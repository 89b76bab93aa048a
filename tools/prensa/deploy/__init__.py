"""Deployment manifests rendered from a model repository (`prensa deploy ...`)."""
