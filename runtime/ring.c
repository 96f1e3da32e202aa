/* ring.c — placeholder, being written */
