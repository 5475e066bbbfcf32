import doctest

import training.config


def test_config_doctests() -> None:
    """encoder_config: the feed-forward width follows the hidden size; a width the heads cannot
    split is refused."""
    assert doctest.testmod(training.config).failed == 0
