"""Built-in plugins, registered through the `toolkit` entry-point group like any third-party plugin."""
