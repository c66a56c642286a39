"""Commands: one ``main(argv)`` per command; ``scripts/*.py`` and ``mtl-cog <command>`` call them."""
