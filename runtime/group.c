/* group.c — placeholder, being written */
