/* mpi.c — placeholder, being written */
