__version__ = "0.1.0"
CLIENT = "gpumem-python/" + __version__
