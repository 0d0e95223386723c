/*
 * eventfd_loop - libsm70client inside an application's own poll loop.
 *
 * The application already waits on its own descriptors (here: stdin, to show the shape);
 * it adds sm70_event_fd() to the same poll set, and when that descriptor is readable it
 * drains events with sm70_next_event(..., 0) until -ETIMEDOUT. No thread, no blocking call.
 *
 *   eventfd_loop [SOCKET_PATH] [TOKEN_ID...]
 *
 * Generates 8 greedy tokens from the prompt (default 1 2 3) and prints them. Exit status 0
 * when the job finished normally, 3 when no daemon listens, 1 otherwise.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <sm70/client.h>

int main(int argc, char **argv)
{
	uint32_t prompt[64] = { 1, 2, 3 };
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_client *c = NULL;
	struct sm70_job job;
	uint64_t id;
	int n = 3, ret, done = 0, rc = 1;

	if (argc > 2) {
		for (n = 0; n + 2 < argc && n < 64; n++)
			prompt[n] = (uint32_t)strtoul(argv[n + 2], NULL, 10);
	}
	ret = sm70_client_connect(&c, argc > 1 ? argv[1] : NULL, NULL);
	if (ret) {
		fprintf(stderr, "eventfd_loop: %s\n", sm70_client_last_error(c)[0] ?
			sm70_client_last_error(c) : sm70_strerror(ret));
		sm70_client_close(c);
		return ret == -ENOENT || ret == -ECONNREFUSED ? 3 : 1;
	}
	sm70_job_init(&job);
	job.prompt = prompt;
	job.prompt_len = (uint32_t)n;
	job.max_tokens = 8;
	job.flags = SM70_JOB_IGNORE_EOS;
	ret = sm70_submit(c, &job, &id);
	if (ret) {
		fprintf(stderr, "eventfd_loop: submit: %s\n", sm70_strerror(ret));
		goto out;
	}

	struct pollfd pfd[2] = {
		{ .fd = STDIN_FILENO, .events = 0 }, /* stands for the app's own descriptors */
		{ .fd = sm70_event_fd(c), .events = POLLIN },
	};
	printf("job %llu:", (unsigned long long)id);
	while (!done) {
		if (poll(pfd, 2, 10000) <= 0) {
			fprintf(stderr, "eventfd_loop: no event in 10 s\n");
			goto out;
		}
		if (!(pfd[1].revents & POLLIN))
			continue;
		/* Readable: drain until the library says "nothing more for now". */
		while ((ret = sm70_next_event(c, &ev, 0)) == 0) {
			if (ev.type == SM70_EVENT_TOKEN)
				printf(" %u", ev.token);
			if (ev.flags & SM70_EVENT_FINAL) {
				printf("\nfinish reason %u, %u prompt + %u completion tokens%s%s\n",
				       ev.finish_reason, ev.usage.prompt_tokens,
				       ev.usage.completion_tokens, ev.error ? ": " : "",
				       ev.error ? ev.message : "");
				done = 1;
				rc = ev.error ? 1 : 0;
			}
		}
		if (ret != -ETIMEDOUT && !done) {
			fprintf(stderr, "eventfd_loop: %s\n", sm70_strerror(ret));
			goto out;
		}
	}
out:
	sm70_client_close(c);
	return rc;
}
