/* layer.c — placeholder, being written */
