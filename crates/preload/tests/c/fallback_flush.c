/* fallback_flush ADDR PORT COUNT: a UDP socket with a small send buffer
 * (8 KiB) sends up to COUNT datagrams of 1000 bytes to ADDR:PORT without
 * blocking (refused sends are not counted), then at once sets an option
 * the engine does not honour (the socket moves to the kernel path while
 * the engine still holds what the link has not taken), closes it and
 * exits. Prints "sent S". */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1)
        return 2;
    int count = atoi(argv[3]);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    int small = 8192;
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    char buf[1000];
    memset(buf, 'x', sizeof buf);
    int sent = 0;
    for (int i = 0; i < count; i++)
        if (sendto(s, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&a, sizeof a) == (ssize_t)sizeof buf)
            sent++;
    int on = 1;
    setsockopt(s, SOL_SOCKET, SO_TIMESTAMP, &on, sizeof on);
    close(s);
    printf("sent %d\n", sent);
    return 0;
}
