/* fault.c — placeholder, being written */
