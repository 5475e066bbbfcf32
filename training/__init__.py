"""Training-side tools: vocab, synthetic corpus, model building, training, export, evaluation.

May import TensorFlow and bert4keras (always after ``import nlp``); the server never imports this.
"""
