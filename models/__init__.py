"""The demo models, installed as package data (``spo_models``): see ``nlp.config.packaged_model_dir``."""
