"""The deploy templates, installed as package data (``spo_deploy``): see ``app.serving.server``."""
