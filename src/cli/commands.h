/* Subcommands: each takes argv with argv[0] = its own name and returns the exit status. */
#ifndef SLUICE_CLI_COMMANDS_H
#define SLUICE_CLI_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_info(int argc, char **argv);

#endif
