/* rope.c — placeholder, being written */
