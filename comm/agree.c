/* agree.c — placeholder, being written */
