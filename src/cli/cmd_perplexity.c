#include "cli/commands.h"
int cmd_perplexity(int argc, char **argv) { (void)argc; (void)argv; return 2; }
